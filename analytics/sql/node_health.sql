-- Per node over [since, until): requests and failures.
SELECT node, count(*) AS requests, count(*) FILTER (WHERE failed) AS failures
FROM requests
WHERE start_time >= $since AND start_time < $until
GROUP BY ALL
