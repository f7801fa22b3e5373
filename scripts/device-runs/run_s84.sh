#!/usr/bin/env bash
# run S84: generate() with library kernels only, its batch-1 ablation now fair (ffda471:
# each mode in lockstep with torch alone; S77's all-modes lockstep switched the shared
# adaptive model before each step and read adaptive 0.996x where the two-mode lockstep
# read 0.975x), so the ablation's "adaptive" row should read as the lockstep does and the
# other rows say which switch closes the gap; and the first reading of the decode-steps
# hook's attention switch (808b615: transformers' own SDPA function for the steps whose held
# attention class is SDPA, as the ablation's "transformers' SDPA attention" mode runs)
source "$(dirname "$0")/setup.sh"
generate 480
