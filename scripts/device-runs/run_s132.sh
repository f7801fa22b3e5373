#!/usr/bin/env bash
# run S132 (at most about 60 s, a fresh machine or after another run; the corpus packs
# carried in .whl/corpus): a miss's decide timed on the H200 machine's host, as on the
# CPU (benchmarks/cpu_decide.py): S127/S128's selection read the policy's decide at
# 3.7-4.9 ms a first result where this CPU decides the same ops in 1.1-2.1 ms; a slower
# host, or a decide slowed by the process's other threads
source "$(dirname "$0")/setup.sh"
probe 60 decide 8 benchmarks/cpu_decide.py --repeats 30 --corpus .whl/corpus
