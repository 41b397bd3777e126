-- jobs/configs/terminal_stats.yaml as SQL: per-terminal count, sum and mean of card
-- transactions, every terminal of the public key file released (its YAML twin's release key).
--   dppipeline sql --file jobs/sql/terminal_stats.sql --explain
SELECT WITH DIFFERENTIAL_PRIVACY
  OPTIONS (epsilon = 10, delta = 1e-6, privacy_unit_column = CUSTOMER_ID,
           max_groups_contributed = 8, max_contributions_per_partition = 20)
  TERMINAL_ID,
  COUNT(*) AS count,
  SUM(TX_AMOUNT, contribution_bounds_per_row => (0, 200)) AS sum,
  AVG(TX_AMOUNT, contribution_bounds_per_row => (0, 200)) AS mean
FROM transactions
RIGHT OUTER JOIN `../../schemas/public_terminals.csv` USING (TERMINAL_ID)
GROUP BY TERMINAL_ID
