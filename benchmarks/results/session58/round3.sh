#!/usr/bin/env bash
# Session 58, r3: round2.sh again on c95f20f (the bundle checks every module at import, as before r2).
OUT=${OUT:-r3} bash "$(dirname "$0")/round2.sh"
