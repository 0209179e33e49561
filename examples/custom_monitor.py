# The article's custom monitor (section 3), unchanged but for its import line.
import json
import time

from otel_mindformers import BaseMonitor


class CustomMetricMonitor(BaseMonitor):
    def __init__(self, monitor_config):
        super().__init__(monitor_config)
        self.alert_threshold = monitor_config.alert_config.loss_threshold
        self.log_file = open(monitor_config.json_log_path, "a", encoding="utf-8")

    def on_train_step_end(self, run_context):
        """每个step结束触发"""
        cb_params = run_context.original_args()
        cur_step = cb_params.cur_step_num
        loss = float(cb_params.train_loss.asnumpy())
        lr = float(cb_params.learning_rate.asnumpy())
        metric_data = {"time_stamp": time.time(), "step": cur_step, "loss": loss, "lr": lr}
        # 写入日志
        self.log_file.write(json.dumps(metric_data, ensure_ascii=False) + "\n")
        self.log_file.flush()
        # 实现告警逻辑
        if loss > self.alert_threshold:
            print(f"【监控告警】step {cur_step} loss超过阈值loss{loss:.4f}")
            # 可扩展http推送告警到监控平台

    def on_train_end(self, run_context):
        self.log_file.close()
