"""``python -m minitp.generate`` runs this."""

from .cli import main

main()
