-- wrk script: at the end of a run, writes its latency histogram to the file named by
-- WRK_HIST, one line per distinct latency: microseconds, then how many requests took that
-- long. With it the rounds of a bench can be pooled into one percentile over all their
-- requests (benches/lib/wp_report.py), which one p99 per round cannot give.
-- wrk's stats object, indexed from 1, returns (value, count) for its i-th non-empty bucket
-- and a value of 0 past the last one.
done = function(summary, latency, requests)
  local f = assert(io.open(os.getenv("WRK_HIST"), "w"))
  local i = 1
  while true do
    local v, n = latency(i)
    if v == 0 then break end
    f:write(string.format("%d %d\n", v, n))
    i = i + 1
  end
  f:close()
end
