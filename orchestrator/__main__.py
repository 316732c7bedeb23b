"""``python -m orchestrator`` and the ``runyard`` command (``run``, pyproject's entry point).

The CLI's modules (SQLAlchemy, pydantic, click, runyard's own) are imported with the cyclic
garbage collector off, then frozen (:func:`trainer.lifecycle.settle_imports` says why): about
130,000 objects that live as long as the process. A long-lived command (``runyard scheduler``,
``up``, ``ui``) thus never scans them again in its full collections either.
"""

import gc


def run() -> None:
    gc.disable()
    from orchestrator.cli.group import main  # noqa: PLC0415 - imported with the collector off
    from trainer.lifecycle import settle_imports  # noqa: PLC0415 - imported with the collector off

    settle_imports()
    main()


if __name__ == "__main__":
    run()
