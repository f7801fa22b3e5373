#!/usr/bin/env bash
# run S180 (about 300 s; the forty-first session's last device time). On an H200: S179b
# (the H200 pack extended with the long prefills, the selection on it). On an H100: the
# example server against plain PyTorch (serve_both, dense, eager) on the tree with the
# extended H100 pack, then the selection a fifth time
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H200*)
    nvrtc_variants 60 attention/flash_mma,attention/flash2_mma,attention/flash2_pair_mma,attention/flash2_ksplit_mma,attention/flash_wgmma
    extend_pack scripts/device-runs/long_prefills.json long_prefills 100
    selection_as extended 125 ;;
  *)
    serve_both 200
    selection_as fifth 100 ;;
esac
