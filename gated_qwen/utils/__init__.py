"""Small shared helpers: the names commands accept, device and dtype resolution, logging verbosity, import hooks."""
