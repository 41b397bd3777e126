"""The book's Tumult session with dppipeline.Session (docs/tutorials/python-api.md).

dppipeline generate --output data/book --table book_transactions --single-file --format csv
python examples/api/tumult_session.py data/book/book_transactions.csv
"""

import sys

import pandas as pd

import dppipeline

rows = pd.read_csv(sys.argv[1], parse_dates=["TX_DATETIME"])
scope = "book_transactions.csv/CUSTOMER_ID"  # what `dppipeline run` calls this file's scope
session = dppipeline.Session(rows, ledger="ledger.sqlite", scope=scope, cap=3.5)


def count(where, name):
    return dppipeline.query(
        metrics=["count"], filter=where, max_contributions_per_partition=50, name=name
    )


print(session.release(count(None, "total"), epsilon=1))
print(session.release(count("TX_AMOUNT < 25", "under_25"), epsilon=1))
print(session.release(count("TX_AMOUNT >= 25 and TX_AMOUNT < 50", "from_25_to_50"), epsilon=1))
print(session.remaining())
try:
    session.release(count("TX_AMOUNT >= 50", "over_50"), epsilon=1)
except dppipeline.BudgetExceeded as refused:
    print("refused:", refused)
    print("left:", refused.remaining_epsilon)
print(session.release(count("TX_AMOUNT >= 50", "over_50"), epsilon=session.remaining().epsilon))
print(session.remaining())
