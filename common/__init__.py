"""What every layer uses: user errors, atomic writes, storage refusals, device names and
the command-line helpers (one ``error:`` line and exit 2). The lowest layer: it imports
nothing of the project's other packages."""
