#!/usr/bin/env bash
# Writes a throwaway CA and a server and a client certificate signed by it
# into DIR (ca.pem, server.pem/.key, client.pem/.key; EC P-256, one day,
# SAN localhost and 127.0.0.1) for the tests that run a coordinator with
# mutual TLS. Usage: tests/make-test-certs.sh DIR
set -euo pipefail
dir=${1:?usage: make-test-certs.sh DIR}
cd "$dir"
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
echo "subjectAltName=DNS:localhost,IP:127.0.0.1" > san.ext
openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -days 1 -subj /CN=dynmo-test-ca 2>/dev/null
for who in server client; do
  openssl req "${ec[@]}" -keyout "$who.key" -out "$who.csr" -subj "/CN=localhost" 2>/dev/null
  openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
    -out "$who.pem" -days 1 -extfile san.ext 2>/dev/null
done
