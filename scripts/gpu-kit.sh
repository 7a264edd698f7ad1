#!/usr/bin/env bash
# Gathers the Debian 12 packages a GPU machine needs to build DynMo into
# build-gpu-kit/ (ignored), as .deb files that scripts/gpu-check.sh unpacks
# there with `dpkg-deb -x` into a private prefix. Run it here, on a machine
# with Debian 12's package registry; the GPU machine has none, but it has
# PyTorch (LibTorch), CUDA's nvcc, CMake and g++ of its own.
#
# The kit is the build's libraries (gRPC, Protobuf, Abseil, prometheus-cpp,
# nlohmann-json, spdlog and fmt, GoogleTest, Google Benchmark, gloo's
# headers), ninja, and
# the dependencies apt resolves for them, less what any Linux with a C++
# toolchain already has (glibc, libstdc++, libgcc), the packaging and login
# machinery they pull in (dpkg, debconf, PAM, ...), and what the build never
# loads (gloo's own library and its RDMA/redis stack: LibTorch carries gloo;
# libcurl's protocol stack: only prometheus-cpp's push library uses curl,
# which DynMo doesn't link, but its CMake config insists on finding it).
# It must stay under 64 MiB: it travels with the working tree to the device.
#
#   bash scripts/gpu-kit.sh     (re-run to refresh; prints what it gathered)
set -euo pipefail
cd "$(dirname "$0")/.."
kit=build-gpu-kit
limit_mib=64

roots=(
  libgrpc++-dev libgrpc++1.51 libgrpc29 protobuf-compiler-grpc
  libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler
  libabsl-dev libabsl20220623
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0
  nlohmann-json3-dev
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9
  libgtest-dev libgmock-dev
  libbenchmark-dev libbenchmark1debian
  libgloo-dev
  ninja-build
)
# Never in the kit (exact names). Extracted into the prefix and put on
# LD_LIBRARY_PATH, a second glibc or libstdc++ would break every program.
exclude=(
  # the C/C++ runtime and toolchain: the GPU machine's own
  libc6 libc6-dev libc-dev-bin linux-libc-dev libcrypt1 libcrypt-dev
  libnsl2 libnsl-dev libtirpc3 libtirpc-dev libtirpc-common rpcsvc-proto
  libgcc-s1 gcc-12-base libstdc++6
  # packaging, users and login: never loaded by the build
  dpkg debconf cdebconf adduser passwd tar install-info libacl1 libmd0 liblzma5
  libdebian-installer4 libnewt0.52 libslang2 libtextwrap1
  readline-common libreadline8 libtinfo6
  libpam0g libpam-modules libpam-modules-bin libpam-runtime
  libaudit1 libaudit-common libcap-ng0 libdb5.3
  libselinux1 libsemanage2 libsemanage-common libsepol2 libpcre2-8-0
  libbz2-1.0 libzstd1 libffi8 libcom-err2 libkeyutils1
  # googletest's sources (libgtest-dev ships the built libraries); catch2,
  # which libspdlog-dev depends on for its own tests only
  googletest catch2
  # gloo's library and its transports: LibTorch links its own gloo
  libgloo0 libhiredis-dev libhiredis0.14 libibverbs-dev libibverbs1
  ibverbs-providers libnl-3-200 libnl-3-dev libnl-route-3-200 libnl-route-3-dev
  # libcurl4's protocol stack (FindCURL needs only curl's header and library)
  libbrotli1 libgssapi-krb5-2 libk5crypto3 libkrb5-3 libkrb5support0
  libidn2-0 libunistring2 libldap-2.5-0 libsasl2-2 libsasl2-modules-db
  libnghttp2-14 libpsl5 librtmp1 libgnutls30 libgmp10 libhogweed6 libnettle8
  libp11-kit0 libtasn1-6 libssh2-1
)

resolve() {
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "${roots[@]}" |
    grep -v '^[ <]' | sort -u
}
deps=$(resolve)
if [ -z "$deps" ] || ! grep -qx libgrpc29 <<<"$deps"; then
  # No package lists yet (a fresh machine): fetch them once.
  echo "gpu-kit: apt-get update" >&2
  apt-get update -q >&2
  deps=$(resolve)
fi
excluded=" ${exclude[*]} "
packages=()
for p in $deps; do
  case "$p" in *-doc | *-dbg | *-dbgsym | python* | *-perl) continue ;; esac
  [[ "$excluded" == *" $p "* ]] && continue
  packages+=("$p")
done

tmp="$kit.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
echo "gpu-kit: downloading ${#packages[@]} packages into $kit/" >&2
if ! (cd "$tmp" && apt-get download -q "${packages[@]}" >&2); then
  # Stale lists name versions the mirror no longer has: refresh and retry.
  apt-get update -q >&2
  (cd "$tmp" && apt-get download -q "${packages[@]}" >&2)
fi
for f in "$tmp"/*.deb; do
  dpkg-deb --info "$f" >/dev/null || { echo "gpu-kit: $f is not a readable .deb" >&2; exit 1; }
done
# A manifest for gpu-check.sh's report: package, version, bytes.
for f in "$tmp"/*.deb; do
  printf '%s\t%s\t%s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" "$(stat -c %s "$f")"
done >"$tmp/MANIFEST.tsv"
rm -rf "$kit"
mv "$tmp" "$kit"

column -t -s $'\t' "$kit/MANIFEST.tsv"
bytes=$(du -sb "$kit" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
count=$(wc -l <"$kit/MANIFEST.tsv")
echo "gpu-kit: $count packages, $mib MiB in $kit/"
if ((bytes > limit_mib * 1048576)); then
  echo "gpu-kit: FAIL: $kit/ is $mib MiB, over the device's ${limit_mib} MiB for the tree and carried paths" >&2
  exit 1
fi
# What travels to the device: the tree git would see plus the kit.
# (A tracked file deleted in the working tree makes du fail: not the kit's fault.)
tree=$(git ls-files -co --exclude-standard -z | du --files0-from=- -cb 2>/dev/null | tail -1 | cut -f1 || true)
tree=${tree:-0}
if ((tree + bytes > limit_mib * 1048576)); then
  echo "gpu-kit: WARNING: working tree ($((tree / 1048576)) MiB) plus the kit exceed ${limit_mib} MiB" >&2
fi
