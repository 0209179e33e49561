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


def observed(metrics_data) -> dict[str, list[tuple[float, dict]]]:
    """One collection's points by metric name, as (value, attributes) (a histogram's value:
    None); `metrics_data` None (the SDK's answer when nothing was observed) is no points."""
    points: dict[str, list[tuple[float, dict]]] = {}
    for resource_metrics in metrics_data.resource_metrics if metrics_data else []:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    points.setdefault(metric.name, []).append((value, dict(point.attributes)))
    return points
