// express-rate-limit in front of the reporting API's three endpoints (support/stock_programs.py).
// Usage: node server.js '{"windowMs": 2000, "limit": 10, "standardHeaders": "draft-7"}'
// Prints {"port": N} once listening on 127.0.0.1; GET /__arrivals returns every
// answered request as [arrived, status, answered, idempotency key] (Unix seconds).
"use strict";
const express = require("express");
const { rateLimit } = require("express-rate-limit");

const options = JSON.parse(process.argv[2] || "{}");
const tooMany = {
  success: false,
  error: {
    code: "TOO_MANY_REQUESTS",
    message: "Too many requests: slow down and retry later.",
  },
};
const endpoints = [
  ["post", "/teams/:teamId/data/run-query", "run-query"],
  ["post", "/teams/:teamId/members/invite", "invite"],
  ["put", "/users/me/avatar", "avatar"],
];
// Wall clock with sub-millisecond resolution, comparable with Python's time.time().
const now = () => (performance.timeOrigin + performance.now()) / 1000;
const arrivals = [];

const app = express();
app.disable("x-powered-by");
// Registered before the logger: reading the log is not an arrival.
app.get("/__arrivals", (request, response) => response.json(arrivals));
app.use((request, response, next) => {
  const at = now();
  response.on("finish", () => {
    arrivals.push([at, response.statusCode, now(), request.get("idempotency-key") || null]);
  });
  next();
});
for (const [method, path, name] of endpoints) {
  // One limiter (and so one MemoryStore) per endpoint: each counts on its own.
  const limiter = rateLimit({
    windowMs: options.windowMs ?? 2000,
    limit: options.limit ?? 10,
    standardHeaders: options.standardHeaders ?? "draft-7",
    legacyHeaders: options.legacyHeaders ?? true,
    message: tooMany,
  });
  app[method](path, limiter, (request, response) => {
    response.json({ success: true, data: { endpoint: name } });
  });
}
const server = app.listen(0, "127.0.0.1", () => {
  console.log(JSON.stringify({ port: server.address().port }));
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
// Kept-alive connections would hold close() open: give up on them after a moment.
process.on("SIGTERM", () => setTimeout(() => process.exit(0), 500).unref());
