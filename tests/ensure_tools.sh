#!/usr/bin/env bash
# What `make test` needs beyond Python: bubblewrap (`bwrap`, the code-interpreter sandbox),
# Node.js with npm (the Codex and Claude Code end-to-end tests install those clients with npm) and
# nginx (the ingress example, docker/nginx.conf, is tested in front of the gateway).
# Installs what is missing with apt-get (as root, or with passwordless sudo), or stops with one
# message naming what to install. The tests never skip for want of these: they fail.
set -euo pipefail

missing() {
  local out=()
  command -v bwrap >/dev/null 2>&1 || out+=(bubblewrap)
  command -v node >/dev/null 2>&1 || out+=(nodejs)
  command -v npm >/dev/null 2>&1 || out+=(npm)
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || out+=(nginx-light)
  echo "${out[*]:-}"
}

need=$(missing)
[ -z "$need" ] && exit 0

as_root=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
fi
if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ ${#as_root[@]} -gt 0 ]; }; then
  echo "tests/ensure_tools.sh: installing $need (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  # shellcheck disable=SC2086  # $need is a list of package names
  if ! "${as_root[@]}" apt-get install -y -q $need >/dev/null 2>&1; then
    "${as_root[@]}" apt-get update -q >/dev/null 2>&1 || true
    "${as_root[@]}" apt-get install -y -q $need >/dev/null 2>&1 || true
  fi
fi

need=$(missing)
if [ -n "$need" ]; then
  echo "make test needs $need (bubblewrap for the code-interpreter sandbox, Node.js/npm for the" \
    "Codex and Claude Code end-to-end tests, nginx for the ingress example) and could not install it: install it (e.g." \
    "'apt-get install $need') and run make test again." >&2
  exit 1
fi
