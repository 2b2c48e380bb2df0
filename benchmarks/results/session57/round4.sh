#!/usr/bin/env bash
# Session 57, r4: round3.sh again (a second sample, on a fresh machine), its output under r4.
OUT=${OUT:-r4} exec bash "$(dirname "$0")/round3.sh"
