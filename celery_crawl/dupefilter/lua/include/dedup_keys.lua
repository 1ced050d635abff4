-- The names of a dedup filter's keys: included, never run alone. Generated from
-- celery_crawl.core.keys, where each form is defined once (DEDUP_KEYS lists the
-- same names, with their types, for the repair of damaged keys).
--
-- Uses: nothing from the including script.
-- Defines: dedup_kind_key(dedup), sets_bucket_key(base, generation, bucket),
-- sets_count_key(base), sets_removed_key(count), bloom_key(dedup),
-- bloom_filter_key(bloom, i), expiring_key(dedup), expiring_base_key(dedup, t).

--!generated celery_crawl.core.keys:lua_dedup_keys
