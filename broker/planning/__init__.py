"""Planning: the cost policy, the offer request every backend is asked with, the planner that chooses,
the plan a job keeps, and the runtime estimate it is priced with (broker/stages/offer_rounds.py runs them)."""
