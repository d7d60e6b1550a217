"""Policy: every default sparsec decides on its own: the host's facts (`machine`), the
default schedules as explicit commands (`schedules`), the candidates ``schedule="auto"``
times (`tuning`), and the runtime's cost models with their measured constants (`costs`)."""
