SELECT WITH DIFFERENTIAL_PRIVACY
  OPTIONS (epsilon = 10, delta = 1e-6, privacy_unit_column = CUSTOMER_ID,
           max_groups_contributed = 8, max_contributions_per_partition = 20, noise = 'laplace')
  TERMINAL_ID,
  COUNT(*) AS count,
  SUM(TX_AMOUNT, contribution_bounds_per_row => (0, 200)) AS sum,
  AVG(TX_AMOUNT, contribution_bounds_per_row => (0, 200))
FROM transactions
RIGHT OUTER JOIN `../../schemas/public_terminals.csv` USING (TERMINAL_ID)
GROUP BY TERMINAL_ID
