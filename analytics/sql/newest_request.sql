-- The newest stored request's start at or before $not_after (the wall clock and a skew allowance), which a
-- relative time counts back from: a node whose clock runs ahead does not carry it into the future, where
-- `--since 1h` would find nothing. The newest of all where every request is later (this host's clock behind).
SELECT coalesce(max(start_time) FILTER (WHERE start_time <= $not_after), max(start_time)) AS newest FROM requests
