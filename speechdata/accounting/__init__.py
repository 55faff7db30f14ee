"""Accounting: the rejects ledger, the stage contract, and the per-product ledgers that gate publishing."""
