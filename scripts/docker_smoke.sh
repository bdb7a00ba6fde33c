#!/usr/bin/env bash
# Deployment smoke test, for real: a Docker engine (installed and started when none runs), a base
# image made locally (no image registry is reachable here), the compose images, `compose up` over
# a small scifact slice, /search checked on loopback, a second indexer run that must skip the
# build, and `compose down -v` on any exit. Runs as root (apt-get, dockerd, debootstrap).
#
# Environment: BEIR_DATA (../shared/data/beir), SMOKE_DOCS (300 documents), SMOKE_REPORT (write a
# JSON report there), HYBRID_BASE_IMAGE (a local image with Python 3.11 instead of the debootstrapped
# one), TORCH_WHEELS (/opt/wheels: where the pinned torch CPU wheel is looked for), DOCKERD_LOG.
set -euo pipefail
cd "$(dirname "$0")/.."

beir="${BEIR_DATA:-../shared/data/beir}"
docs="${SMOKE_DOCS:-300}"
project=hybrid-smoke
base_image="${HYBRID_BASE_IMAGE:-hybrid-base:bookworm}"
started=$SECONDS
phases=()

log() { printf '[docker-smoke %4ss] %s\n' "$((SECONDS - started))" "$*" >&2; }
timed() {  # timed NAME COMMAND...: run it and record its wall time
  local name=$1 t=$SECONDS
  shift
  "$@"
  phases+=("$name=$((SECONDS - t))")
}

[ -f "$beir/scifact/corpus.jsonl" ] || { echo "error: no scifact under $beir (set BEIR_DATA)" >&2; exit 2; }

ensure_engine() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null || missing+=(docker-compose)
  if [ "$base_image" = hybrid-base:bookworm ] && ! command -v debootstrap >/dev/null; then missing+=(debootstrap); fi
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
  fi
  if ! docker info >/dev/null 2>&1; then
    local dockerd_log="${DOCKERD_LOG:-/var/log/hybrid-dockerd.log}"
    log "starting dockerd (log: $dockerd_log)"
    # Containers here use host networking only: no docker0 bridge, no NAT rules.
    nohup dockerd --bridge=none --iptables=false --ip6tables=false >"$dockerd_log" 2>&1 &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { tail -20 "$dockerd_log" >&2; echo "error: dockerd did not start" >&2; exit 1; }
  fi
  if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
  compose+=(-p "$project")
  log "engine $(docker version --format '{{.Server.Version}}'), $("${compose[@]}" version | head -1)"
}

# A minimal Debian bookworm with Python 3.11 from the host's apt mirror, trusting what the host
# trusts (a TLS-inspecting egress proxy's CA included), imported as an image. Cached as the image.
ensure_base() {
  if docker image inspect "$base_image" >/dev/null 2>&1; then log "base image $base_image present"; return; fi
  [ "$base_image" = hybrid-base:bookworm ] || { echo "error: base image $base_image not found locally" >&2; exit 2; }
  local mirror
  mirror="$(awk '$1 == "URIs:" {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
  rootfs="$(mktemp -d)"
  log "debootstrap bookworm from ${mirror:=http://deb.debian.org/debian}"
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log" >&2; exit 1; }
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null
  fi
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  # pip's own certifi bundle lacks such a CA: point it at the system store.
  tar -C "$rootfs" -c . | docker import --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' --change 'CMD ["/bin/bash"]' - "$base_image" >/dev/null
  rm -rf "$rootfs" "$rootfs.log"
  rootfs=
}

# The pinned torch exists only as a local wheel: hard-link it into the (git-ignored) find-links
# folder of the build context.
stage_torch_wheel() {
  local wheel
  for wheel in "${TORCH_WHEELS:-/opt/wheels}"/torch-*.whl; do
    [ -f "$wheel" ] || { log "no local torch wheel: the indexer image takes torch from the package index"; return; }
    [ -f "docker/wheels/${wheel##*/}" ] || ln -f "$wheel" docker/wheels/ 2>/dev/null || cp "$wheel" docker/wheels/
  done
}

build_images() {
  log "building images on $base_image"
  "${compose[@]}" build indexer api
  # The service image must run without torch.
  if docker run --rm --network none --entrypoint python hybrid-retrieval:api-cpu -c "import torch" 2>/dev/null; then
    echo "error: torch is importable in the api image" >&2; exit 1
  fi
  [ "$(docker image inspect -f '{{.Config.User}}' hybrid-retrieval:api-cpu)" = hybrid ] || { echo "error: api image runs as root" >&2; exit 1; }
}

# The first $docs documents, and the test queries all of whose judged documents are among them.
make_slice() {
  python3 - "$beir/scifact" "$work" "$docs" <<'EOF'
import csv, itertools, json, sys
from pathlib import Path

src, work, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
(work / "corpus").mkdir()
with (src / "corpus.jsonl").open() as fh:
    lines = list(itertools.islice(fh, n))
(work / "corpus" / "corpus.jsonl").write_text("".join(lines))
ids = {json.loads(line)["_id"] for line in lines}
judged = {}
with (src / "qrels" / "test.tsv").open() as fh:
    for row in csv.DictReader(fh, delimiter="\t"):
        if int(row["score"]) > 0:
            judged.setdefault(row["query-id"], set()).add(row["corpus-id"])
texts = {q["_id"]: q["text"] for q in map(json.loads, (src / "queries.jsonl").open())}
queries = [{"id": q, "text": texts[q], "relevant": sorted(rel)} for q, rel in judged.items() if rel <= ids]
(work / "queries.json").write_text(json.dumps(queries))
print(f"{len(ids)} documents, {len(queries)} test queries judged within them", file=sys.stderr)
EOF
  chmod -R a+rX "$work"  # read by the container's non-root user
}

wait_healthy() {
  local container status
  container="$("${compose[@]}" ps -q api)"
  for _ in $(seq 150); do
    status="$(docker inspect -f '{{.State.Health.Status}}' "$container")"
    [ "$status" = healthy ] && return
    [ "$(docker inspect -f '{{.State.Running}}' "$container")" = true ] || break
    sleep 2
  done
  echo "error: api not healthy (status: ${status:-none})" >&2
  exit 1
}

# /ready, then every slice query on /search: well-formed hits, and a judged document in the top 10.
check_search() {
  python3 - "$HYBRID_PORT" "$work/queries.json" "$docs" "$work/search.json" <<'EOF'
import json, sys, urllib.request

port, queries, docs, out = sys.argv[1], json.load(open(sys.argv[2])), int(sys.argv[3]), sys.argv[4]
base = f"http://127.0.0.1:{port}"

def call(path, body=None):
    data = None if body is None else json.dumps(body).encode()
    # the stack runs with a write key (for the write check below), which searches then need too
    request = urllib.request.Request(base + path, data=data, headers={"content-type": "application/json",
                                                                      "X-API-Key": "smoke-writer"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)

ready = call("/ready")
assert ready.get("documents") == docs, f"/ready: {ready}"
found = 0
for q in queries:
    body = call("/search", {"query": q["text"], "k": 10, "mode": "hybrid"})
    hits = body["hits"]
    assert 0 < len(hits) <= 10 and all({"id", "score", "rank"} <= h.keys() for h in hits), hits
    assert [h["rank"] for h in hits] == list(range(1, len(hits) + 1))
    assert all(a["score"] >= b["score"] for a, b in zip(hits, hits[1:]))
    found += any(h["id"] in q["relevant"] for h in hits)
for mode in ("bm25", "dense"):
    assert call("/search", {"query": queries[0]["text"], "k": 5, "mode": mode})["hits"], mode
share = found / len(queries)
print(f"/search: a judged document in the top 10 for {found}/{len(queries)} queries", file=sys.stderr)
json.dump({"ready": ready, "queries": len(queries), "hit_at_10": share}, open(out, "w"))
assert len(queries) >= 5 and share >= 0.8, f"hit@10 {share:.2f} over {len(queries)} queries"
EOF
}

# A write through the API, then `compose restart api`: the written document must still be there and searchable.
write_and_restart() {
  python3 scripts/smoke_writes.py "$HYBRID_PORT" put
  "${compose[@]}" restart api >/dev/null
  wait_healthy
  python3 scripts/smoke_writes.py "$HYBRID_PORT" check
}

rerun_indexer() {
  "${compose[@]}" run --rm -T indexer >"$work/rerun.log" 2>&1 || { cat "$work/rerun.log" >&2; exit 1; }
  grep -q "build skipped" "$work/rerun.log" || { cat "$work/rerun.log" >&2; echo "error: the indexer rebuilt an unchanged corpus" >&2; exit 1; }
  log "second indexer run: $(tail -1 "$work/rerun.log")"
}

cleanup() {
  local rc=$?
  if [ -n "${compose[*]:-}" ]; then
    [ $rc -eq 0 ] || "${compose[@]}" logs --no-color --tail 50 >&2 || true
    "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
  fi
  [ -z "${rootfs:-}" ] || rm -rf "$rootfs" "$rootfs.log"
  [ -z "${work:-}" ] || rm -rf "$work"
  log "done (exit $rc) in $((SECONDS - started)) s"
}
compose=()
rootfs=
work=
trap cleanup EXIT

timed engine ensure_engine
timed base_image ensure_base
stage_torch_wheel
work="$(mktemp -d)"
make_slice
export HYBRID_BASE_IMAGE="$base_image" HYBRID_CORPUS="$work/corpus" HYBRID_HOST=127.0.0.1 HYBRID_WRITE_KEYS=smoke-writer
HYBRID_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
export HYBRID_PORT
timed build build_images
"${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true  # a leftover of an interrupted run
log "compose up (index, then serve on 127.0.0.1:$HYBRID_PORT)"
timed up "${compose[@]}" up -d api
timed healthy wait_healthy
timed search check_search
timed writes write_and_restart
timed reindex rerun_indexer

sizes="$(docker images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^(hybrid-retrieval|hybrid-base):' || true)"
printf '%s\n' "$sizes" >&2
if [ -n "${SMOKE_REPORT:-}" ]; then
  python3 - "$work/search.json" "$SMOKE_REPORT" "$sizes" "$((SECONDS - started))" "${phases[@]}" <<'EOF'
import json, sys

report = json.load(open(sys.argv[1]))
report["images"] = dict(line.split(" ", 1) for line in sys.argv[3].splitlines())
report["wall_s"] = int(sys.argv[4])
report["phases_s"] = {k: int(v) for k, v in (arg.split("=") for arg in sys.argv[5:])}
json.dump(report, open(sys.argv[2], "w"), indent=2)
EOF
fi
log "smoke test passed"
