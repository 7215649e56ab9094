"""``python -m usg`` — same as the ``usg`` console script."""

from usg.cli import main

if __name__ == "__main__":
    main()
