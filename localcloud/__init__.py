"""localcloud: local stand-ins that speak Kubernetes', Aliyun OSS's and ECS's real wire protocols.

Imported as csbench.localcloud. Each service is an aiohttp application driven by the real clients
(kubectl, kopf, oss2, alibabacloud-oss-v2, the ECS SDK) in tests, benches and `make demo`.
"""
