"""Certification, bottom-up: the job protocol (jobs.py), CERTIFY/PREDICT (cohen.py), the sequential
rule, the scheduler, the Monte Carlo voter, Smooth."""
