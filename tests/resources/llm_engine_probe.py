"""``python llm_engine_probe.py serve MODEL ...``: ``transformers serve`` with a probe that prints,
when a streamed generation stops, ``usg-probe: generation finished after N tokens`` or
``usg-probe: generation cancelled after N tokens`` (the engine aborts a generation whose client
went away at its next token). The e2e tests read these lines to see the engine stop generating;
the engine itself is unchanged. Prints ``usg-probe: unavailable (...)`` if this transformers
version has no such hook (the tests then skip what needs it)."""

from __future__ import annotations

import sys


def _install() -> None:
    try:
        from transformers.cli.serving import utils

        streamer, cancelled = utils.DirectStreamer, utils._GenerationCancelled
        put, end = streamer.put, streamer.end
    except (ImportError, AttributeError) as exc:
        print(f"usg-probe: unavailable ({exc})", flush=True)
        return

    def probed_put(self, value):  # type: ignore[no-untyped-def]
        try:
            return put(self, value)
        except cancelled:
            print(f"usg-probe: generation cancelled after {self.total_tokens} tokens", flush=True)
            raise

    def probed_end(self):  # type: ignore[no-untyped-def]
        print(f"usg-probe: generation finished after {self.total_tokens} tokens", flush=True)
        return end(self)

    streamer.put, streamer.end = probed_put, probed_end
    print("usg-probe: installed", flush=True)


if __name__ == "__main__":
    _install()
    from transformers.cli.transformers import main

    sys.argv = ["transformers", *sys.argv[1:]]
    main()
