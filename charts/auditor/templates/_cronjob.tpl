{{/*
One of the auditor's CronJobs. Arguments (a dict): root, name, component, values (the
component's values: schedule, timeZone, resources, scheduling), args, and optionally
jobSpec (extra fields of the Job spec), fsGroup, env, envFrom, mounts, volumes (YAML
lists), annotations (extra, YAML).
*/}}
{{- define "auditor.cronjob" -}}
{{- $root := .root -}}
{{- $v := .values -}}
apiVersion: batch/v1
kind: CronJob
metadata:
  name: auditor-{{ .name }}
  namespace: {{ $root.Values.namespaces.main }}
  labels:
    {{- include "auditor.labels" (dict "root" $root "component" .component) | nindent 4 }}
  {{- with trim (printf "%s\n%s" (include "auditor.digestSkip" $root) (.annotations | default "")) }}
  annotations:
    {{- . | nindent 4 }}
  {{- end }}
spec:
  schedule: {{ $v.schedule | quote }}
  timeZone: {{ $v.timeZone }}
  concurrencyPolicy: Forbid
  startingDeadlineSeconds: 3600
  successfulJobsHistoryLimit: 3
  failedJobsHistoryLimit: 3
  jobTemplate:
    spec:
      backoffLimit: 2
      ttlSecondsAfterFinished: 172800
      {{- with .jobSpec }}
      {{- . | nindent 6 }}
      {{- end }}
      template:
        metadata:
          labels:
            {{- include "auditor.podLabels" (dict "root" $root "component" .component) | nindent 12 }}
        spec:
          serviceAccountName: auditor-audit
          automountServiceAccountToken: false
          restartPolicy: OnFailure
          {{- with include "auditor.imagePullSecrets" $root }}{{ . | trim | nindent 10 }}{{ end }}
          {{- include "auditor.podSecurity" (dict "fsGroup" .fsGroup) | nindent 10 }}
          {{- with include "auditor.scheduling" $v }}{{ . | trim | nindent 10 }}{{ end }}
          containers:
            - name: {{ .name }}
              image: {{ include "auditor.image" $root }}
              imagePullPolicy: {{ $root.Values.image.pullPolicy }}
              args: {{ toJson .args }}
              {{- with .envFrom }}
              envFrom:
                {{- . | nindent 16 }}
              {{- end }}
              env:
                {{- with .env }}
                {{- . | nindent 16 }}
                {{- end }}
                {{- include "auditor.env" (dict "root" $root "config" true) | nindent 16 }}
              resources:
                {{- toYaml $v.resources | nindent 16 }}
              {{- include "auditor.containerSecurity" $root | nindent 14 }}
              volumeMounts:
                {{- include "auditor.mounts" (dict "config" true) | nindent 16 }}
                {{- with .mounts }}
                {{- . | nindent 16 }}
                {{- end }}
          volumes:
            {{- include "auditor.volumes" (dict "root" $root "config" true) | nindent 12 }}
            {{- with .volumes }}
            {{- . | nindent 12 }}
            {{- end }}
{{- end }}
