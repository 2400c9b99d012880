{{- define "infer-ctl.labels" -}}
app.kubernetes.io/name: infer-ctl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "infer-ctl.selector" -}}
app.kubernetes.io/name: infer-ctl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end }}

{{- define "infer-ctl.policies" -}}
{{ .Values.policiesConfigMap | default (printf "%s-policies" .Release.Name) }}
{{- end }}
