"""`python -m flashprefill ...` is the `flashprefill` console command."""

from ._cli import main

main()
