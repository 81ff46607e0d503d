"""`duocal chat`: a terminal conversation that keeps one KV cache across turns (session.py)."""
