"""Reading an in-memory SDK metric reader back in tests."""


def counter_values(reader, name: str) -> dict[tuple, float]:
    """Points of metric `name` keyed by their sorted attribute items."""
    points = {}
    for resource_metrics in reader.get_metrics_data().resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        points[tuple(sorted(point.attributes.items()))] = point.value
    return points
