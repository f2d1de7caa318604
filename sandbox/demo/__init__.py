"""`sparkgate demo`: the whole system on kubesim, the same workload without and then with sparkgate."""
