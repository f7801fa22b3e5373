#!/usr/bin/env bash
# run S177 (about 470 s, any Hopper card; the forty-first session's first call): S176's
# owed selection on the tree as it is, then the shipped pack of this card extended with
# 16 long prefills (long_prefills.json: causal MHA L=3584-8192, GQA 32/8 at 4096 and 8192,
# three non-causal; none an input of the selection's streams) and the selection on it
# twice. Why: long-burst's causal B=1 H=8 L=4096 D=64 committed flash_wgmma at 1.05-1.16x
# flash2_ksplit_mma PAIR=1, which the model, having no causal prefill longer than 3061,
# ranks 3% slower than PAIR=0 (it ran 0.74x). S177b follows on the same machine.
source "$(dirname "$0")/setup.sh"
export PYTHONFAULTHANDLER=1
card_header
selection_as base 125
nvrtc_variants 60 attention/flash_mma,attention/flash2_mma,attention/flash2_pair_mma,attention/flash2_ksplit_mma,attention/flash_wgmma
extend_pack scripts/device-runs/long_prefills.json long_prefills 100
selection_as extended 125
