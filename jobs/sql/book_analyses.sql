-- The DP book's chapter-5 transaction analyses as one job: four SELECTs, one budget (split by
-- the accountant as the YAML twin's queries are), one ledger charge.
--   dppipeline sql --file jobs/sql/book_analyses.sql --explain
SELECT WITH DIFFERENTIAL_PRIVACY
  OPTIONS (name = 'mean_per_terminal', epsilon = 4, delta = 1e-6,
           privacy_unit_column = CUSTOMER_ID,
           max_groups_contributed = 8, max_contributions_per_partition = 4)
  TERMINAL_ID,
  AVG(TX_AMOUNT, contribution_bounds_per_group => (0, 250)) AS mean
FROM transactions
RIGHT OUTER JOIN UNNEST(GENERATE_ARRAY(0, 99)) USING (TERMINAL_ID)
GROUP BY TERMINAL_ID;

-- Customers who spent 25 or more at least once: one global total.
SELECT WITH DIFFERENTIAL_PRIVACY
  OPTIONS (name = 'customers_spending_25_or_more', max_groups_contributed = 1)
  COUNT(DISTINCT CUSTOMER_ID)
FROM transactions
WHERE TX_AMOUNT >= 25;

SELECT WITH DIFFERENTIAL_PRIVACY
  OPTIONS (name = 'sum_per_terminal_per_day',
           max_groups_contributed = 24, max_contributions_per_partition = 4)
  TERMINAL_ID,
  DATE_TRUNC(TX_DATETIME, DAY) AS day,
  SUM(TX_AMOUNT, contribution_bounds_per_row => (0, 250)) AS sum
FROM transactions
RIGHT OUTER JOIN UNNEST(GENERATE_ARRAY(0, 99)) USING (TERMINAL_ID)
RIGHT OUTER JOIN input_range USING (day)
GROUP BY TERMINAL_ID, day;

-- Transactions by amount: buckets [0, 25), [25, 50), [50, inf), all released (public edges).
SELECT WITH DIFFERENTIAL_PRIVACY
  OPTIONS (name = 'counts_by_amount', max_groups_contributed = 3,
           max_contributions_per_partition = 30)
  RANGE_BUCKET(TX_AMOUNT, [0, 25, 50]) AS TX_AMOUNT_bucket,
  COUNT(*)
FROM transactions
GROUP BY TX_AMOUNT_bucket
