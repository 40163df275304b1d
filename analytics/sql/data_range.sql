-- The time span covered by the stored requests.
SELECT min(start_time) AS first, max(start_time) AS last FROM requests
