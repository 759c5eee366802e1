"""Import hidden states vLLM extracted in the speculators format (logic in draftgate.hidden.importer).

python -m stages.import_hidden --params params.yaml --hs DIR --dataset DIR \
    --tokens data/tokens/tokens.parquet --out data/hidden [--vllm-layers 2,15,27]

Then: draftgate validate expectations/hidden.json data/hidden --input tokens=data/tokens/tokens.parquet
"""

import sys

from draftgate.hidden.importer import main

if __name__ == "__main__":
    sys.exit(main())
