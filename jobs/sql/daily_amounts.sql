-- Count and amount of card transactions per day of the input: a DATE_TRUNC key, every day of
-- the input released (input_range: the days are public, the period read).
--   dppipeline sql --file jobs/sql/daily_amounts.sql --explain
SELECT WITH DIFFERENTIAL_PRIVACY
  OPTIONS (epsilon = 1, delta = 1e-6, privacy_unit_column = CUSTOMER_ID,
           max_groups_contributed = 31, max_contributions_per_partition = 10)
  DATE_TRUNC(TX_DATETIME, DAY) AS day,
  COUNT(*) AS count,
  SUM(TX_AMOUNT, contribution_bounds_per_row => (0, 300)) AS sum
FROM transactions
RIGHT OUTER JOIN input_range USING (day)
GROUP BY day
