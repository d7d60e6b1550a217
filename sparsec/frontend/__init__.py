"""The frontend: index-notation text parsed and checked into an AST (`parser`, `notation`),
and each sum placed (`concrete`: concrete index notation)."""
