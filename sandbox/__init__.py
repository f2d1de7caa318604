"""The sandbox wing: sparkgate installed on kubesim, on one machine, for the demo, the tests and the benchmarks.

It may import everything (kubesim, the webhook, the allocator); nothing in the production packages
(`sparkgate`, `webhook`, `allocator`, `certs`) imports it, and the image does not contain it
(docs/architecture.md, "Layout").
"""
