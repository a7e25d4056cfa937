"""torch.compile benchmark: torch eager vs torch.compile's default (inductor) vs torch.compile(backend="luminal"),
on the models of model_zoo.py (the same torch modules; luminal gets them through dynamo and AOT autograd), with the
share of aten ops that fell back to torch. The native-API rows are benchmarks/models.py; this is the same driver
with other engines.

    python benchmarks/torch_compile.py                      # every model, batch 1 and 8, CPU, 2 threads
    python benchmarks/torch_compile.py --models minilm --batches 1 --runs 10
"""
import sys

import models

if __name__ == "__main__":
    args = models.parse_args()
    if args.worker:
        import json

        print(json.dumps(models.worker(json.loads(args.worker))))
    else:
        if "--engines" not in sys.argv:
            args.engines = "luminal-tc,eager,inductor"
        models.main(args)
