"""The control plane: store, executor, service loop. The only code that talks to Ray or the database."""
