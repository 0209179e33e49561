"""The MindCluster bridge's offline readers: the words `report` and its HTML page use for the
ClusterD fault that ended an attempt (analysis layer: no live module imports these)."""
