"""The floor of a Streamlit page here: a bare page served the way runyard's UI serves its own.

    .venv/bin/python bench/streamlit_floor.py --port 8599     # serves until SIGTERM

Streamlit's ASGI app (``st.App``) over bench/streamlit_floor_page.py, with the Streamlit options
and the uvicorn settings of app/server.py, and nothing in front (no gate, no database). The page
draws a title and one Altair line chart of ``ranks x points`` rows, the size of the Run page's
first curve (8 ranks x 1,000 buckets: app/views/run.py's CHART_ROWS). bench_render.py starts it
beside runyard's UI and times both in the same browser, taking turns: what any Streamlit page
with one chart costs on this machine, against what runyard's Run page costs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from app.server import STREAMLIT_OPTIONS, bind  # noqa: E402 - needs ROOT on sys.path

PAGE = Path(__file__).with_name("streamlit_floor_page.py")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    import streamlit as st  # noqa: PLC0415 - after the options pass, as app/server.py
    import uvicorn  # noqa: PLC0415
    from altair.utils.schemapi import disable_debug_mode  # noqa: PLC0415
    from streamlit import config as streamlit_config  # noqa: PLC0415
    from streamlit.web import bootstrap  # noqa: PLC0415

    streamlit_config._main_script_path = str(PAGE)
    bootstrap.load_config_options({key.replace(".", "_"): value for key, value in STREAMLIT_OPTIONS.items()})
    disable_debug_mode()
    sock = bind("127.0.0.1", args.port)
    print(f"floor page on http://127.0.0.1:{args.port}/", flush=True)
    config = uvicorn.Config(st.App(PAGE), lifespan="on", access_log=False, log_level="warning",  # type: ignore[arg-type]
                            ws_max_size=200 * 1024 * 1024, ws_per_message_deflate=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
