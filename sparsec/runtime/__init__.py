"""The call path: build and load a generated kernel, bind and marshal a call's inputs,
dispatch it (sparse output, panels, whole, GPU), and the fast path for repeated calls."""
