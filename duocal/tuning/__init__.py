"""`duocal tune`: measure quality against KV memory per sparsity on the user's data, choose the largest
sparsity within a tolerance of full attention, and write it into the profile with a record of how."""
