#!/usr/bin/env bash
# A month of nightly releases against a rolling-window cap (docs/tutorials/nightly-releases.md): the cap
# stored in the ledger once (budget set-cap), one release per day of data at epsilon 0.2, a cap
# of epsilon 2.5 and delta 1e-5 per 30 days of data (the ledger composes the nights at that
# delta: 20 fit in a window, where sums would allow 12), a retried night, and the chart.
# Usage: examples/nightly_month.sh [WORKDIR]
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$here/demo/nightly}"
dp="$here/.venv/bin/dppipeline"
rm -rf "$work" && mkdir -p "$work"
cd "$work"
export DPPIPELINE_LEDGER="sqlite:///$work/ledger.sqlite"
"$dp" generate --output tx --days 35 --customers 2000 --terminals 200 --tx-per-day 5000 >/dev/null 2>&1
# The scope's cap is governed data: stored once, with a history row; every job is held to it.
"$dp" budget set-cap card_tx/CUSTOMER_ID --epsilon 2.5 --delta 1e-5 --window-days 30
cat > nightly.yaml <<'YAML'
name: terminal_stats
metrics: [count, sum, mean]
budget:
  epsilon: 0.2          # one night's release
  delta: 1.0e-6
  scope: card_tx/CUSTOMER_ID   # its stored cap: epsilon 2.5, delta 1e-5 over any 30 days
bounds: {max_partitions_contributed: 4, max_contributions_per_partition: 3, min_value: 0, max_value: 200}
partition_selection: {public_partitions: ../../schemas/public_terminals.csv}
YAML
sed -i "s#../../schemas#$here/schemas#" nightly.yaml
for n in $(seq 1 31); do
  day=$(date -d "2026-01-01 + $((n - 1)) days" +%F)
  if "$dp" run --config nightly.yaml --input tx --output "releases/$day" \
      --start-date "$day" --end-date "$day" >/dev/null 2>"night-$day.log"; then
    echo "$day released"
  else
    echo "$day refused (exit $?): $(tail -1 "night-$day.log")"
  fi
done
echo "retry of 2026-01-15: $("$dp" run --config nightly.yaml --input tx --output releases/2026-01-15 \
  --start-date 2026-01-15 --end-date 2026-01-15 2>&1 >/dev/null | tail -1)"
"$dp" budget show
"$dp" budget plot --scope card_tx/CUSTOMER_ID --output spend.png
