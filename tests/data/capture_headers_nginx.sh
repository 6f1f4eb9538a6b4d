#!/usr/bin/env bash
# Capture the headers stock nginx limit_req sends, for tests/test_hints.py.
# Not run by CI. To refresh the fixture (needs nginx, e.g. apt-get install nginx-light):
#   bash tests/data/capture_headers_nginx.sh > tests/data/ratelimit_headers_nginx.json
# It serves on 127.0.0.1:18089 with `limit_req` at 2 requests per minute (no burst,
# answering 429), sends 3 requests and records the 1st (200) and the 3rd (429).
set -euo pipefail
dir=$(mktemp -d)
trap 'nginx -p "$dir" -c nginx.conf -s stop 2>/dev/null || true; rm -rf "$dir"' EXIT
mkdir -p "$dir/logs"
# A static file, not `return 200`: `return` runs in the rewrite phase, before
# limit_req's preaccess phase, so it would never be limited. World-readable, as
# nginx's workers run as another user.
echo ok > "$dir/index.html"
chmod 755 "$dir"
cat > "$dir/nginx.conf" <<CONF
pid $dir/nginx.pid;
error_log $dir/logs/error.log;
events {}
http {
  access_log off;
  limit_req_zone \$binary_remote_addr zone=two:1m rate=2r/m;
  server {
    listen 127.0.0.1:18089;
    location / { root $dir; limit_req zone=two; limit_req_status 429; }
  }
}
CONF
nginx -p "$dir" -c nginx.conf
sleep 0.5
python3 - "$(nginx -v 2>&1)" <<'PY'
import json, sys, time, urllib.error, urllib.request

DROP = {"date", "server", "content-length", "content-type", "connection", "etag", "last-modified", "accept-ranges"}
fixtures = []
for n in (1, 2, 3):
    try:
        response = urllib.request.urlopen("http://127.0.0.1:18089/")
    except urllib.error.HTTPError as refused:
        response = refused
    if n == 2:
        continue
    headers = {k.lower(): v for k, v in response.headers.items() if k.lower() not in DROP}
    fixtures.append({
        "server": sys.argv[1].removeprefix("nginx version: ").replace("/", " "),
        "config": "limit_req_zone rate=2r/m; limit_req (no burst); limit_req_status 429",
        "request": n,
        "status": response.status,
        "now": time.time(),
        "headers": headers,
    })
json.dump(fixtures, sys.stdout, indent=2)
sys.stdout.write("\n")
PY
