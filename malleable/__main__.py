"""`python -m malleable` runs the command-line interface."""

from malleable.cli import main

if __name__ == "__main__":
    main()
