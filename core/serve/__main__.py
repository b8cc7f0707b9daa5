"""python -m core.serve --model {tiny|smollm2-135m-instruct|PATH} [--host 127.0.0.1] [--port 8000] [--block-size 16]
[--num-blocks N] [--enable-prefix-caching] [--kv-events-config JSON]: see core/serve/server.py."""

import sys

from core.serve.server import main

if __name__ == "__main__":
    sys.exit(main())
