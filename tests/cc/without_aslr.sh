#!/usr/bin/env bash
# Runs a ThreadSanitizer test binary with address-space randomisation off.
#
# TSan maps its shadow memory at fixed addresses when the program starts; with
# randomisation a shared library can already sit there, and TSan then fails
# before any test runs ("ThreadSanitizer failed to allocate 0x... bytes at
# address ... (errno: 12)": seen once in a clean-clone CI run on 2026-11-26,
# not reproduced in the next three runs). setarch -R removes that chance.
# Where setarch is missing or refused (a container whose seccomp profile
# forbids the personality call), the binary runs as before.
#
# Usage: tests/cc/without_aslr.sh BINARY [ARGS...]
set -euo pipefail
if command -v setarch >/dev/null 2>&1 && setarch "$(uname -m)" -R true 2>/dev/null; then
  exec setarch "$(uname -m)" -R "$@"
fi
exec "$@"
