// Captures the rate-limit response headers that stock express-rate-limit sends,
// for tests/test_hints.py. Not run by CI. To refresh the fixture:
//   cd "$(mktemp -d)" && npm install express@5 express-rate-limit@8 &&
//   node /path/to/tests/data/capture_headers.js > /path/to/tests/data/ratelimit_headers_express.json
// It serves on 127.0.0.1 (a free port), sends 3 requests per configuration to a
// limiter allowing 2 per 60 s, and records the 1st (200) and the 3rd (429).
const { createRequire } = require("node:module");
const local = createRequire(process.cwd() + "/");
const express = local("express");
const { rateLimit } = local("express-rate-limit");
const { readFileSync } = require("node:fs");
const { join } = require("node:path");
const version = (name) =>
  JSON.parse(readFileSync(join(process.cwd(), "node_modules", name, "package.json"))).version;

const configs = [
  { standardHeaders: "draft-6", legacyHeaders: true },
  { standardHeaders: "draft-7", legacyHeaders: false },
  { standardHeaders: "draft-8", legacyHeaders: false },
];

async function main() {
  const app = express();
  configs.forEach((options, i) => {
    app.get(`/c${i}`, rateLimit({ windowMs: 60_000, limit: 2, ...options }), (req, res) =>
      res.json({ ok: true }),
    );
  });
  const server = app.listen(0, "127.0.0.1");
  await new Promise((resolve) => server.once("listening", resolve));
  const base = `http://127.0.0.1:${server.address().port}`;
  const fixtures = [];
  for (const [i, options] of configs.entries()) {
    for (let n = 1; n <= 3; n++) {
      const response = await fetch(`${base}/c${i}`);
      const now = Date.now() / 1000;
      await response.arrayBuffer();
      if (n === 2) continue;
      // fetch's Headers lower-cases names and joins repeats with ", ", as httpx does.
      const headers = Object.fromEntries(response.headers.entries());
      for (const name of ["date", "etag", "connection", "keep-alive", "content-length", "content-type", "x-powered-by"]) {
        delete headers[name];
      }
      fixtures.push({
        server: `express ${version("express")} + express-rate-limit ${version("express-rate-limit")}`,
        config: `windowMs: 60000, limit: 2, standardHeaders: '${options.standardHeaders}', legacyHeaders: ${options.legacyHeaders}`,
        request: n,
        status: response.status,
        now,
        headers,
      });
    }
  }
  server.close();
  process.stdout.write(JSON.stringify(fixtures, null, 2) + "\n");
}

main();
