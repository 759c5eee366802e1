"""DVC stage `contract`: the tokenizer contract (logic in draftgate.contract).

python -m stages.contract --params params.yaml --out data/contract/contract.json --metrics metrics/contract.json
"""

import sys

from draftgate.contract import main

if __name__ == "__main__":
    sys.exit(main())
