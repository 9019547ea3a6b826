"""``python -m minitp.debug diverge <minitp.train flags>`` (`minitp.debug.cli`)."""

from .cli import main

main()
