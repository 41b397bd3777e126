-- The median amount per terminal (PyDP's quantile tree over [0, 300]) and the customers seen
-- there: COUNT(DISTINCT <privacy unit>) is privacy_id_count.
--   dppipeline sql --file jobs/sql/median_amount.sql --explain
SELECT WITH DIFFERENTIAL_PRIVACY
  OPTIONS (epsilon = 3, delta = 1e-6, privacy_unit_column = CUSTOMER_ID,
           max_groups_contributed = 8, max_contributions_per_partition = 10)
  TERMINAL_ID,
  PERCENTILE_CONT(TX_AMOUNT, 0.5, contribution_bounds_per_row => (0, 300)) AS percentile_50,
  COUNT(DISTINCT CUSTOMER_ID) AS privacy_id_count
FROM transactions
RIGHT OUTER JOIN `../../schemas/public_terminals.csv` USING (TERMINAL_ID)
GROUP BY TERMINAL_ID
