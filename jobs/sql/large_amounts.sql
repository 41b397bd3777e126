-- Transactions of 100 dollars or more per terminal: a WHERE clause is the job's filter, and
-- SUM's per-group bound is a customer's total at a terminal (here 5 rows of at most 300).
--   dppipeline sql --file jobs/sql/large_amounts.sql --explain
SELECT WITH DIFFERENTIAL_PRIVACY
  OPTIONS (epsilon = 2, delta = 1e-6, privacy_unit_column = CUSTOMER_ID,
           max_groups_contributed = 4, max_contributions_per_partition = 5)
  TERMINAL_ID,
  COUNT(*),
  SUM(TX_AMOUNT, contribution_bounds_per_group => (500, 1500))
FROM transactions
RIGHT OUTER JOIN UNNEST(GENERATE_ARRAY(0, 999)) USING (TERMINAL_ID)
WHERE TX_AMOUNT >= 100 AND TX_AMOUNT < 300
GROUP BY TERMINAL_ID
