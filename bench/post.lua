-- wrk script for bench/admission.py: POSTs the captured AdmissionReviews in turn and prints one JSON line.
--   BENCH_BODIES   colon-separated paths of the request bodies
--   BENCH_CLOSE    "1": send "Connection: close" (wrk then reconnects, a TLS handshake per request)

local requests = {}
local next_index = 0

function init(args)
  local headers = { ["Content-Type"] = "application/json" }
  if os.getenv("BENCH_CLOSE") == "1" then
    headers["Connection"] = "close"
  end
  for path in string.gmatch(os.getenv("BENCH_BODIES") or "", "[^:]+") do
    local f = assert(io.open(path, "rb"))
    local body = f:read("*a")
    f:close()
    requests[#requests + 1] = wrk.format("POST", nil, headers, body)
  end
  assert(#requests > 0, "BENCH_BODIES names no file")
end

function request()
  next_index = next_index % #requests + 1
  return requests[next_index]
end

function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format(
    'BENCH-JSON {"requests":%d,"duration_us":%d,"bytes":%d,"errors":{"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d},"latency_us":{"mean":%.1f,"p50":%d,"p90":%d,"p99":%d,"max":%d}}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
